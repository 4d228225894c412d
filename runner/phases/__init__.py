"""One module per phase, each with one entry point; ``runner.pipeline`` composes them."""
