"""What dtype an expression has and which line made it so: torch knowledge, imports, scopes,
facts, strings and loops, casts, loads, and the provenance analysis that ties them together."""
