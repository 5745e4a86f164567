"""Stage `tokens`: chat-template rendering and loss masks (`chat`), the rule's entry
(`stage`)."""
