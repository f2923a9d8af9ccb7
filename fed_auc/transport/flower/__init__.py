"""The Flower transport: ``fed-auc coordinator`` (a SuperLink and the ServerApp that drives the
coordinator), ``fed-auc node`` (a SuperNode and the long-lived worker that serves one site),
the message codec and the pilot certificates. Nothing here imports the in-process simulation.
"""
