"""The sources ``superserial.convert`` reads: one module per foreign format, each turning it
into a superserial dataset through ``foreign/writing.py`` or the write loop."""
