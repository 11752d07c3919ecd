"""Intake on the network thread (route, rate, admit, shed), admission, the worker pool and its
autoscaler, the worker side of a batch, the cascade. May import `pipeline`, `transport`, `obs`, `config`."""
