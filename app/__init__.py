"""The application layer: the `forgestream` CLI and its commands, the `up` supervisor, and the views of
a run (status, progress, report). It starts roles and reads their topics; nothing below imports it."""
