"""Who may do how much: each caller's quota and its fair share of the gateway
(quotas.py, fairshare.py), between the doors and the core; and which version of a model a
request gets, with copies to a shadow candidate compared in typed terms (rollout.py,
shadow.py, compare.py)."""
