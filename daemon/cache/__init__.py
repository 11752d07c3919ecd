"""The result cache: its key, admission, the memory tier and the disk tier. Imports nothing of the daemon but `errors`."""
