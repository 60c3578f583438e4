"""The searches that use the rules: which reductions share a pass (search.py) and the correction
each rolling component needs (correction.py), over the data types of types.py.

Layering: fusion/ sits above rules/ (the rewrite data it saturates with) and extract/view, terms
(reading terms out of an e-graph); extract/plans reads only fusion.types. Nothing is imported here,
so importing fusion.types does not pull in the searches (and with them extract/).
"""
