print("preview-push: not built yet")
