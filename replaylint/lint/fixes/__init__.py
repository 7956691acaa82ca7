"""From what a rule wants to how the source changes: drafts, float32 spelling and imports,
located edits, and the loop that applies fixes until the file is stable."""
