"""The end-to-end demonstration: FrozenLake agents and simulated policies behind the proxy."""
