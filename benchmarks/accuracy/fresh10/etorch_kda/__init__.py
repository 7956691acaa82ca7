"""KDA hybrid Llama for on-device export: model, source transforms, export manager, program files, runners."""
