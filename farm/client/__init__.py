"""What a person runs and reads: the `farm` command, status and progress, the record cache, doctor."""
