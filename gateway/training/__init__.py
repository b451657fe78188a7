"""Offline side of the difficulty classifier: datasets, labels, head fitting, export, calibration.

Never imported by the serving code (gateway.classifier); it builds the artifacts serving loads.
"""
