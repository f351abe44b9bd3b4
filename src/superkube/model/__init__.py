"""The cluster model, the bottom wing: a stack's spec, what it is validated with, and the address
plan that proves it fits Azure's limits (spec, VM sizes, teams, rates, ipam). Imports no other wing."""
