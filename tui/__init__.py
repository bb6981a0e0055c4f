"""The Textual terminal app (`edgemem chat`), installed as `edgemem.tui`.

`edgemem.tui.app.EdgememApp` is the app; `edgemem.tui.config` its settings file;
`edgemem.tui.screens` the help, add-path, settings and confirm dialogs. It uses
`edgemem.assistant.Assistant` and the library store, like the CLI does; the core never imports it.
"""
