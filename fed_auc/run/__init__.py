"""One run's lifecycle for both transports: start the coordinator, warm up, hold a site out, train,
export, close.
"""
