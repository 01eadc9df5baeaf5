"""What the lessons train: offline datasets (shipped or generated, never downloaded) and small Keras models."""
