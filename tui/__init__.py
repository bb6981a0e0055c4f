"""The Textual terminal app (`edgemem chat`), installed as `edgemem.tui`.

Not built yet: the chat app is its own issue. It will use `edgemem.assistant.Assistant` and the
library store, like the CLI does.
"""
