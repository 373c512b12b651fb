"""The deployment's wiring, generated from the job and topic tables (``sluice generate``).

Development time only: no Lambda function imports this package, and Sluice's own
packaging leaves it out of every function's zip.
"""
