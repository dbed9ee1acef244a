"""Training workloads: config, context, models, data, the training loop and the torchrun launcher."""
