"""What the lessons train: offline datasets (shipped or generated, never downloaded), small Keras models, and a
tiny GPT (``gpt``) whose block the split versions reuse."""
