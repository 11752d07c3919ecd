"""Counters and histograms, the stats topic, node sums, Prometheus, status, the throttled log. May import `config`."""
