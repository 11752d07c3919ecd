"""The result cache: key, admission, memory tier, disk tier. Imports nothing of the daemon but `errors`."""
