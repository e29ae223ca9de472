error('not implemented yet')
