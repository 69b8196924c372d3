"""Other frameworks' input pipelines: PyTorch, Grain, Ray Data and Apache Beam (public as
``superserial.torch``, ``superserial.grain``, ``superserial.ray`` and ``superserial.beam``)."""
