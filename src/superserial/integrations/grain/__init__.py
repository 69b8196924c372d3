"""Grain input from superserial datasets (TF-free): the data source and the shuffled dataset;
public as ``superserial.grain``."""
