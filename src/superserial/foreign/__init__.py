"""Datasets written by other tools made superserial datasets (``sources/``, through
``convert``), and superserial datasets written out for them (``export``, ``tfindex``)."""
