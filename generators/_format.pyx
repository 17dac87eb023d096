# placeholder: replaced by the generator formatter
