"""A method that fedapp does not ship, added the way the README's "Adding a method" says: one
folder (settings section, server half, client half); the test adds its row to the method table.

FedAvg with a server learning rate (FedAvgM without momentum): the new global model moves
``toy.server-lr`` of the way from the old one to the clients' mean, and each client trains
``toy.client-epochs`` epochs. With a rate of 1 and the run's local epochs it is FedAvg exactly.
"""
