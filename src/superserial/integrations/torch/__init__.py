"""PyTorch input from superserial datasets (TF-free): the datasets, their sampler, batching,
conversion to tensors and the workers' shared memory; public as ``superserial.torch``."""
