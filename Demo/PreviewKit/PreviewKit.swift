// Preview protocol and file handling (see issue 5).
