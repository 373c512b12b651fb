"""Sluice: durable background work for serverless Python."""
