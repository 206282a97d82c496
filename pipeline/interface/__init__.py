"""The work behind the commands (MLC-LLM's `interface/`): the CLI parses arguments and calls these."""
