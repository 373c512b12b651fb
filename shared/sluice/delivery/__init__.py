"""delivery"""
