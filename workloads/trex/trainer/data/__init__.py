"""Training data: sources (JSONL text/chat, built-in demo corpus), tokenizer, packing and a resumable loader."""
