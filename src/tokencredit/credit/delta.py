"""(being implemented)"""
