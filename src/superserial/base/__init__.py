"""The base every room stands on: settings from the environment, byte sizes written by people,
progress reporting, whether another process is alive, and glibc's threshold for large blocks.
Imports nothing of superserial but the base itself."""
