"""The policy registry: versioned, reversible policies in PostgreSQL (issue 15)."""
