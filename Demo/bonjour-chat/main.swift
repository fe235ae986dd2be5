print("bonjour-chat: not built yet")
