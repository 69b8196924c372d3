"""The base every room stands on: settings from the environment, byte sizes written by people,
progress reporting, and whether another process is alive. Imports nothing of superserial but
the base itself."""
