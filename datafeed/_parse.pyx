# placeholder: replaced by the parser
