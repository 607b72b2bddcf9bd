"""The repository state, its log commands and checkpoint codec."""
