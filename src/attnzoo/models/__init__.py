"""attnzoo.models: one file per classic attention model, built only from `attnzoo.core`."""
