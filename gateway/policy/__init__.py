"""Who may do how much: each caller's quota and its fair share of the gateway
(quotas.py, fairshare.py), between the doors and the core."""
