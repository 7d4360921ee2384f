"""The shared contracts: configuration, errors, Redis keys, messages, device profiles, secrets."""
