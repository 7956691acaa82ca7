"""Language models: the KDA hybrid (``KDAModel``) and its inference wrapper."""
