"""Text under the prompt contract: chat encoding (:mod:`trex.text.chat`) and the byte-level BPE (:mod:`trex.text.tokenizer`)
shared by the trainer, ORData and the chat-template checks."""
