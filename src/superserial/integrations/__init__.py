"""Other frameworks' input pipelines: PyTorch, Grain and Apache Beam (public as
``superserial.torch``, ``superserial.grain`` and ``superserial.beam``)."""
