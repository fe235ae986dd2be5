// Chat room logic (see issue 4).
