"""Models on the CPU: interpreters over both backends, preprocessing steps, residency (scale to zero).
Imports nothing of the daemon but `errors`."""
