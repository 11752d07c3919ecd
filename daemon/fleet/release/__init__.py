"""What a node and the controller both read: the release format and its minisign signatures, desired documents, refusal codes."""
