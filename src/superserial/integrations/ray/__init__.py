"""Ray Data reads and writes of superserial datasets (TF-free); public as ``superserial.ray``."""
