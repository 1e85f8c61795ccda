mod simulator;
