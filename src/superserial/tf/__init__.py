"""The TensorFlow side: ``save``, ``Writer``, ``append`` and ``load`` with its streamed and
shuffled readers."""
