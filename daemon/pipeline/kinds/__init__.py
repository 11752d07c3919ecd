"""Output kinds: what a model's dequantized outputs become in a reply."""
