"""The TensorFlow side: ``save``, ``Writer``, ``append`` and ``load`` with its streamed and
shuffled readers.

Importing any module here without TensorFlow installed raises
:class:`~superserial.errors.MissingDependencyError` naming the ``tf`` extra, not a bare
``ModuleNotFoundError`` from deep inside.
"""

from superserial.errors import require

require("tensorflow", extra="tf", needed_for="superserial's TensorFlow side", package="TensorFlow")
