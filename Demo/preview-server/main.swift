print("preview-server: not built yet")
