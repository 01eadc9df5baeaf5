"""Where the lessons run: logical devices, the environment, TensorFlow imported quietly, fresh processes,
strategies, local clusters of worker processes, and the device-configuration names of older tutorials."""
